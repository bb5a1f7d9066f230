"""Pure decisions: functions of (job, observed state, now) that return what should be. No I/O."""
