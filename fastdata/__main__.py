import sys

from fastdata.cli import main

sys.exit(main())
