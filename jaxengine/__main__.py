import sys

from jaxengine.cli import main

sys.exit(main())
