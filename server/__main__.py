import sys

from rknn_server.cli import main

sys.exit(main())
