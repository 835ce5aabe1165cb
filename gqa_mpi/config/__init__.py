"""What a run is: its configuration, its inputs, its decode loop, its mode. No MPI.

========  =====================================================================
config    Config: every option of a run, declared once and checked
modes     the two local steps (emulated, or the kernel's own file), chosen once
inputs    generated or .npy inputs, independent of the rank count
loop      the decode loop's arithmetic: the growing cache, placements
========  =====================================================================
"""
