"""`python -m rknn_client.cli`: the same as `rknn-client`."""

import sys

from rknn_client.cli.commands import main

sys.exit(main())
