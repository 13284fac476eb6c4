"""Foundations every stage reads: checked file I/O, prompt sets, the measurement setting, speed arithmetic. No torch."""
