"""``python -m helpers``: the workbook's command line (see helpers/workbook/cli.py)."""

import sys

from helpers.workbook.cli import main

sys.exit(main())
