"""Configuration files: options (``options``), local addresses (``addr_file``), preload data
(``hosts_file``, ``route_file``), generated templates (``opts_template``) and default paths
(``paths``). Parsers are pure: text in, settings plus ``ConfigIssue`` list out."""
