"""`python3 -m spyreshim report ...`: the command line without the launcher
(run needs SPYRESHIM_LIB then, as there is no script to look next to)."""
import sys

from .cli.main import main

sys.exit(main())
