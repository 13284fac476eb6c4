"""`python -m workbench.cli`: the same entry point as the `workbench` script."""
import sys

from workbench.cli import main

sys.exit(main())
