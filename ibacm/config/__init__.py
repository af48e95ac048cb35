"""Configuration files: options (``options``), local addresses (``addr_file``), preload data
(``hosts_file``, ``route_file``), generated templates (``opts_template``), default paths
(``paths``) and the admin socket an operator tool talks to (``admin_target``). Parsers are
pure: text in, settings plus ``ConfigIssue`` list out."""
