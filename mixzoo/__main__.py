import faulthandler

from .cli import main

# a process that dies in native code (a segfault or abort in a CUDA library) prints the Python stack
# of every thread to stderr, where a sweep's or reproduction's log keeps it, instead of vanishing
faulthandler.enable()
raise SystemExit(main())
