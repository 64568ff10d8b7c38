import sys

from console.command import main

sys.exit(main())
