from lakefuse.cli import main

raise SystemExit(main())
