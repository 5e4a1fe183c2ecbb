"""Reports: markdown results tables and matplotlib figures from evaluation metrics and DVCLive logs."""
