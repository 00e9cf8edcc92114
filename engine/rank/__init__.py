"""What runs inside one launched rank: its entry (`entry`: set-up, train, the one-line error and
the exit), the trainer (`trainer`), this rank's data (`rank_data`), the run's facts for its report
(`run_facts`) and where training starts (`restore`). Fault-tolerant mode's rank side is in
engine/ft/rank/. Nothing here imports the launching side (engine/launch/'s loop, engine/ft/launch/),
nor the other way round."""
