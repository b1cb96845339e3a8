"""Clock arbitration: who decides each GPU's clock, and the crash-safe record of every lock taken."""
