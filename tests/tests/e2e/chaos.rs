use zerg_tests as _;
