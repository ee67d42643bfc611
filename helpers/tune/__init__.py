"""tune: a user's unmodified training script, made faster, with the change written as code.

``workbook tune -- python train.py ARGS`` runs the script as it is, in separate processes, for a bounded number
of optimizer steps per variant (:mod:`helpers.tune.hook` runs inside each of them), applies the checklist's
techniques at runtime without editing the file (:mod:`helpers.tune.candidates`), measures each against the
unmodified script, interleaved, with a bootstrap interval and the busy-machine check
(:mod:`helpers.tune.engine`), writes the winners as an edit of the user's file at the call sites captured while
it ran (:mod:`helpers.tune.rewrite`, libcst) and proves the rewritten file by running it, as written, against the
original (:mod:`helpers.tune.engine`). :mod:`helpers.tune.report` writes the run folder.

Layer: beside ``experiments`` (it measures A/B), below ``workbook`` (the command line calls it). The hook
imports only the standard library and torch, because it runs inside the user's process.
"""
