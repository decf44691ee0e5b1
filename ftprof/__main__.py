import sys

from ftprof.cli.main import main

sys.exit(main())
