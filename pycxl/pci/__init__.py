"""PCI devices on the bus (``devices``), a device's link (``link``) and its CXL DVSEC
capability (``caps``): floor 1, the domain."""
