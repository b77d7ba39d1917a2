"""`rknn-client deploy`: install or upgrade this project's daemon on a board over adb, offline.

board.py probes the board and refuses the ones the daemon cannot run on; bundle.py builds the wheels
on the PC; install.py pushes them, installs them into a venv on the board, (re)starts the daemon and
checks that it answers.
"""
