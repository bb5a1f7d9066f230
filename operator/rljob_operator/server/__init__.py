"""The operator's own HTTPS endpoint: the status API that trainers report to, and its certificate."""
