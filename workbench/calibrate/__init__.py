"""`workbench calibrate`: run.py measures heads over a prompt set (torch); folder.py reads what it wrote (no torch)."""
