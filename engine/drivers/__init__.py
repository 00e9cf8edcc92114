"""What runs in the launching process: the launcher's process loop (`launcher`), restart-all
(`restart`), the watch over the ranks' files (`rank_watch`), the run directory's lock
(`run_lock`), fault-tolerant mode's supervisor (`ft_supervisor`), its nodes (`ft_nodes`), its
launch over ssh (`ft_over_ssh`) and torchft's lighthouse (`lighthouse`), and the paper tables'
runner (`table_runner`). Nothing here imports what runs inside a rank (engine/rank/), nor the
other way round: the two sides meet only in the run directory's files (core/run_files.py)."""
