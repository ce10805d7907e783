import sys

from endpoint_client.cli import main

sys.exit(main())
