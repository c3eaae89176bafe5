import sys

from redwood.cli.main import main

sys.exit(main())
