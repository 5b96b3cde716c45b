"""Operating a host: ``check`` (findings with severities, for job scripts), ``monitor``
(the kernel's CXL events and hotplug, decoded), ``stat`` (memory-tiering counters as
rates), and the Prometheus textfile format they can write."""
