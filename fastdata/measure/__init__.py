"""Measuring and checking: the loader against the machine's ceiling (bench), loader settings (tune), the doctor, verify."""
