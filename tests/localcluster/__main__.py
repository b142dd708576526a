import sys

from tests.localcluster.cluster import main

sys.exit(main())
