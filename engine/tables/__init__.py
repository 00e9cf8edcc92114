"""Paper tables by one command (`python cli.py table=NAME`): the table config and directory
layout (`config`), the headline metric's direction (`measure`), the tuning (`tuning`), the
per-seed results (`runs`), intervals and tests (`stats`), the family of comparisons (`compare`),
provenance (`provenance`), the results (`render`) and figures (`plots`). Running the rows is a
driver's job (engine/drivers/table_runner.py)."""
