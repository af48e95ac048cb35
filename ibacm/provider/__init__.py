"""Resolution providers: the API (``api``) and how they are found and assigned (``registry``)."""
