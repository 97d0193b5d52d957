"""`python -m mobius_genai`: the `mobius-genai` command, where the console script is not on PATH."""

import sys

from mobius_genai.cli import main

sys.exit(main())
