from mmgate.cli import main

raise SystemExit(main())
