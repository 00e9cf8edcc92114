"""Starting the ranks from cli.py: the `launch` section (`config`), DeepSpeed hostfiles
(`hostfile`), pre-launch checks over ssh (`remote`), the launcher commands and supervision
(`launcher`), and the watch over the ranks' pid and error files (`rank_watch`)."""
