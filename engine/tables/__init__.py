"""Paper tables by one command (`python cli.py table=NAME`): the table config and directory
layout (`config`), tuning grids (`tuning`), intervals (`stats`), the results (`render`) and
figures (`plots`). Running the rows is a driver's job (engine/drivers/table_runner.py)."""
