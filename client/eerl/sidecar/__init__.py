"""eerl's sidecar: a process beside a job that holds the job's daemon session and takes its phase events
over local HTTP, from any language (docs/sidecar.md).

:mod:`eerl.sidecar.server` is the sidecar (``eerl-sidecar``); :mod:`eerl.sidecar.client` the HTTP client
that ``eerl phase`` and the Python client (``EERL_SIDECAR``) use. Importing this package imports neither.
"""
