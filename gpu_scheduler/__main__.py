import sys

from gpu_scheduler.cli import main

sys.exit(main())
