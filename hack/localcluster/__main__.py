import sys

from hack.localcluster.cluster import main

sys.exit(main())
