"""Usage meters: what one call charges, as values (charges), and what a decision makes of
the meters' values (metering)."""
