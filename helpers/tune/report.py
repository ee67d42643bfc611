"""tune's run folder: report.md and report.html from a :class:`helpers.tune.session.TuneResult`.

The report leads with the proven figure (or why there is none), then the change in the user's code (the
diff), each change's own runtime effect, what was not tried and why, and what the figures stand on.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from helpers.tune.candidates import FRAMEWORK_ARGS, NOTEBOOK, reported_only
from helpers.tune.candidates_device import device_reported

__all__ = ["markdown", "write_report"]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def markdown(res: Any) -> str:
    """The report as Markdown (the same text report.html shows)."""
    out = [f"# tune: `{res.command}`", ""]
    if getattr(res, "python", ""):
        out += [f"The interpreter: {res.python}.", ""]
    out += [f"**{res.headline}**", ""]
    if res.diff:
        out += ["## The change in your code", "",
                f"Apply it in your script's folder: `cd {res.script_dir} && git apply {res.out_dir / 'change.diff'}` "
                f"(or `patch -p1 < ...`), or run tune again with `--apply`. The rewritten file is beside this "
                f"report.", "", "```diff", res.diff.rstrip(), "```", ""]
        if res.applied_to:
            out += [f"Applied to `{res.applied_to}`; your original is kept as `{res.backup}`.", ""]
    if getattr(res, "launch", ""):  # a launch setting (the allocator): not code, so not in the diff
        out += ["## The launch command", "", "Run your script with this command line (the allocator is loaded "
                "through `LD_PRELOAD` when the process starts: the Performance Tuning Guide's \"Switch Memory "
                "allocator\"); the diff does not carry it:", "", "```sh", res.launch, "```", ""]
    if res.proof is not None:
        opts = getattr(res, "options", None)
        span = (f"steps {opts.warmup + 1}-{opts.warmup + opts.steps} of each run (after {opts.warmup} warm-up steps)"
                if opts is not None else "the timed steps of each run")
        out += ["## The proof", "", f"The rewritten file against yours, each run a separate process of your script "
                                    f"stopped after its timed steps, interleaved; the figure is per optimizer step, "
                                    f"over {span}: **{res.proof.verdict}**. {res.proof.reason}.", ""]
        out += _job(getattr(res, "job", None) or {})
    if res.judgements:
        edited = [c.name for c in res.candidates if c.apply.get("edits")]
        out += ["## Each change alone, against the unmodified script", "",
                "Each change is applied at runtime, without editing your file"
                + (f"; a framework's own setting ({', '.join(edited)}) runs as a copy of your script with that "
                   f"call edited." if edited else ".")
                + (" A follow-up that builds on a winner is judged against that winner, run in the same "
                   "interleaved way." if any(c.against for c in res.candidates) else ""), "",
                _row(["change", "why it was tried", "verdict", "speedup per step (95% CI)", "notebook"]),
                _row(["---"] * 5)]
        by = {c.name: c for c in res.candidates}
        for j in res.judgements:
            c = by.get(j.variant)
            out.append(_row([j.variant, c.why if c else "", j.verdict, res.figure(j),
                             NOTEBOOK.get(c.technique, "") if c else ""]))
        out += [""] + [f"- **{j.variant}**: {j.reason}." for j in res.judgements] + [""]
    if res.edits_skipped:
        out += ["## Not written", ""] + [f"- {line}" for line in res.not_written()] + [""]
    if res.skipped:
        out += ["## Not tried", ""] + [f"- {line}" for line in not_tried(res.skipped)] + [""]
    reported = reported_only(res.probe) + device_reported(res.probe)
    if reported:  # found, not changed: the Guide's items tune does not rewrite
        out += ["## Reported only", "", "tune found these and does not change them:", ""] + \
            [f"- {line}" for line in reported] + [""]
    found = {c["framework"] for c in getattr(res, "framework_calls", None) or []}
    fw = [m for m in (res.probe.get("frameworks") or []) if m in FRAMEWORK_ARGS and m not in found]
    if fw:  # a framework whose call tune did not find in the script: its arguments, to set where the call is
        out += ["## Set in your framework", "",
                "Your script uses a training framework whose call tune did not find in the script (it is in "
                "another file, or built indirectly); where it builds the DataLoader or sets the precision, the "
                "setting is its argument:", ""] + [f"- {m}: `{FRAMEWORK_ARGS[m]}`" for m in fw]
        out.append("")
    model = res.probe.get("model") or {}
    saved = res.probe.get("saved") or []
    ranks = int(res.probe.get("ranks") or 1)
    sync = ', after a device synchronize' if model.get('param_device') in ('cuda', 'npu') else ''
    run = (f"- Each run is a torchrun job of {ranks} processes of your script on this machine (`--standalone`), "
           f"stopped after its warm-up and timed optimizer steps; a step's time runs from one `optimizer.step()` to "
           f"the next{sync}, on the rank that took longest for that step (the ranks step together, at the slowest "
           f"one's pace), and the DataLoader workers tried are this machine's cores shared among the ranks."
           if ranks > 1 else
           f"- Each run is one process of your script, stopped after its warm-up and timed optimizer steps; a "
           f"step's time runs from one `optimizer.step()` to the next{sync}.")
    out += ["## What this stands on", "", run,
            f"- The model: {model.get('class', 'not found')} on the {model.get('param_device', '?')}, "
            f"{model.get('n_params', 0):,} parameters.",
            f"- The machine: {res.busy or 'not measured'}.",
            "- The results check: a change whose loss became NaN or inf, or whose mean loss over the timed steps "
            "moved beyond 10% (or three times the unmodified runs' own spread), is rejected.",
            f"- {len(res.runs)} runs in {res.seconds:.0f} s; every run is a line of results.jsonl."]
    files = getattr(res, "user_files", None) or []
    if files:
        out.append(f"- Your script wrote {len(files)} file(s) outside this folder; each was kept before the run "
                   f"first changed it and put back after every run (a file the run created was removed): "
                   + ", ".join(f"`{f['path']}` ({f['action']})" for f in files) + ".")
    else:
        out.append("- Your script's runs changed no file of yours outside this folder (files written through "
                   "Python's `open`, `os.replace`/`os.rename`, `os.remove` and `shutil` are watched; each would be "
                   "kept and put back after the run).")
    out.append("- A run whose optimizer step stops advancing for 10x the slowest step the probe saw (at least "
               "30 s) is stopped as stalled, not left to its timeout.")
    if saved:
        out.append(f"- Your script's torch.save wrote {len(saved)} file(s) into this folder's runs/ instead of "
                   f"where it asked (e.g. {saved[0]['asked']}): none of your checkpoints was overwritten.")
    out.append("")
    return "\n".join(out)


def _job(job: dict[str, Any]) -> list[str]:
    """The proof's whole-job section (:func:`helpers.tune.session.job_effect`): each figure says what it covers."""
    o, r = job.get("original"), job.get("rewritten")
    if not o or not r:
        return []
    out = ["## The whole job", "",
           "The proof's figure is per optimizer step. Your command's whole run also holds its start-up and all of "
           "its steps:", "",
           _row(["figure", "what it covers", "yours", "rewritten"]), _row(["---"] * 4),
           _row(["start-up", "measured: from the process's start (before `import torch`) to its first optimizer "
                 "step, mean (range) over the proof's runs",
                 f"{o['startup_s']:.2f} s ({o['startup_range_s'][0]:.2f}-{o['startup_range_s'][1]:.2f})",
                 f"{r['startup_s']:.2f} s ({r['startup_range_s'][0]:.2f}-{r['startup_range_s'][1]:.2f})"]),
           _row(["step", "measured: mean time per timed optimizer step", f"{o['step_s'] * 1e3:.1f} ms",
                 f"{r['step_s'] * 1e3:.1f} ms"])]
    if job.get("steps"):
        out.append(_row(["whole run", f"projected, not measured: start-up + {job['steps']} optimizer steps, "
                         f"{job['how']}; what runs after the last step is not in it",
                         f"{o['projected_s']:.0f} s", f"{r['projected_s']:.0f} s"]))
        out += ["", f"Projected over the whole run, the rewritten script is **{job['speedup']:.2f}x** as fast as "
                    f"yours (per step: the proof's figure above)."]
    else:
        out += ["", f"The steps your command would run are not known ({job['how']}): no whole-run projection."]
    return out + [""]


def _html(md: str) -> str:
    """A plain HTML page from the report's Markdown: headings, paragraphs, lists, tables and code blocks."""
    body: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            j = i + 1
            code = []
            while j < len(lines) and not lines[j].startswith("```"):
                code.append(lines[j])
                j += 1
            rows = []
            for c in code:
                cls = "add" if c.startswith("+") and not c.startswith("+++") else \
                    "del" if c.startswith("-") and not c.startswith("---") else ""
                rows.append(f'<span class="{cls}">{html.escape(c)}</span>' if cls else html.escape(c))
            body.append("<pre>" + "\n".join(rows) + "</pre>")
            i = j + 1
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
        elif line.startswith("| "):
            rows = []
            while i < len(lines) and lines[i].startswith("| "):
                cells = [c.strip() for c in lines[i].strip("|").split(" | ")]
                if not all(set(c) <= {"-"} for c in cells):
                    tag = "th" if not rows else "td"
                    rows.append("<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>")
                i += 1
            body.append("<table>" + "".join(rows) + "</table>")
            continue
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            body.append("<ul>" + "".join(items) + "</ul>")
            continue
        elif line.strip():
            body.append(f"<p>{_inline(line)}</p>")
        i += 1
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.45}"
             "pre{background:#f6f8fa;padding:1em;overflow-x:auto}.add{color:#116329}.del{color:#82071e}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>tune report</title>'
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")


def _inline(text: str) -> str:
    """Escape, then ``code`` and **bold**."""
    out, parts = [], html.escape(text).split("`")
    for k, part in enumerate(parts):
        if k % 2:
            out.append(f"<code>{part}</code>")
        else:
            bits = part.split("**")
            out.append("".join(f"<strong>{b}</strong>" if n % 2 else b for n, b in enumerate(bits)))
    return "".join(out)


def write_report(res: Any) -> tuple[Path, Path]:
    """Write report.md and report.html into the session's folder; return their paths."""
    md = markdown(res)
    md_path, html_path = res.out_dir / "report.md", res.out_dir / "report.html"
    md_path.write_text(md, encoding="utf-8")
    html_path.write_text(_html(md), encoding="utf-8")
    return md_path, html_path


def not_tried(skipped) -> list[str]:
    """The techniques tune did not try, one line per reason: ``"no_sync, bucket_cap_mb (notebook 08): <why>"``.

    Parameters
    ----------
    skipped : sequence of (technique, reason)
        :attr:`helpers.tune.session.TuneResult.skipped`, in order.
    """
    by: dict[str, list[str]] = {}
    for t, r in skipped:
        names = by.setdefault(r, [])
        if t not in names:
            names.append(t)
    out = []
    for reason, names in by.items():
        books = ", ".join(sorted({NOTEBOOK[t] for t in names if t in NOTEBOOK}))
        out.append(f"{', '.join(names)}" + (f" (notebook {books})" if books else "") + f": {reason}")
    return out

