"""The modules of sae-report (tools/sae_report.py, the command): read (a run's files, never
through a link, and its state), plots (PNG and SVG, and the learning-rate schedule) and page
(index.html)."""
