"""Paper tables by one command (`python cli.py table=NAME`): the table config and directory
layout (`config`), running the rows (`runner`), the results (`render`) and figures (`plots`)."""
