"""Providers built for rdma-core's ibacm (``acm_prov.h``) running inside this daemon.

``acm_core.c`` (``libibacm_core.so``) exports the core functions such a provider calls;
``provider.py`` loads the libraries of ``provider_lib_path`` and puts each behind the Python
provider API; ``abi.py`` holds the C structures.
"""
