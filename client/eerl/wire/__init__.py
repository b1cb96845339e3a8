"""The wire vocabulary the client, the job and eerld share: what each side puts on the wire and reads off it.

Both sides import these modules, so that a name, a limit or a metadata key is written once:

- :mod:`eerl.wire.enums`: the one table between the session nouns (:mod:`eerl.phases`,
  :mod:`eerl.directives`) and their proto enums (``eerl.v1``), and the workload to and from its message;
- :mod:`eerl.wire.limits`: the most a phase event may report (the daemon refuses more, the client never
  sends more), and the client's pure check of a workload against them;
- :mod:`eerl.wire.metadata`: the gRPC metadata keys a client sets and eerld reads;
- :mod:`eerl.wire.reports`: a finished session's report (:mod:`eerl.reports`) from its message.

They live in the client distribution (``eerl-client``) because the job needs them without the daemon, and
eerld depends on ``eerl-client`` anyway; they are public, so eerld never imports a private module of
``eerl``. This package's ``__init__`` imports nothing: ``limits`` and ``metadata`` need no protobuf.
"""
