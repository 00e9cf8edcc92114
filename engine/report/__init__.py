"""What a run writes for people: metrics.jsonl and wandb (`metrics`), the progress bar and the
end-of-run files (`run_report`), summary.json's numbers (`summary`), plots (`plots`), and the time
ledger of `report.ledger=true`: its section and per-rank recorder (`ledger_writer`), its files
(`ledger_format`) and its reader (`ledger`)."""
