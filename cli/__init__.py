"""The pycxl command line (installed as pycxl.cli): parse, call the API, render."""
