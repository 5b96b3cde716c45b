"""Floor 2, the resolver: the one name grammar and the node tiers (``tiers``), and the
``System`` a command reads once and resolves names with (``system``)."""
