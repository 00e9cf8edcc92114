"""What a run writes for people: metrics.jsonl and wandb (`metrics`), the progress bar and the
end-of-run files (`run_report`), summary.json's numbers (`summary`), and plots (`plots`)."""
