"""Campaigns: crash, faults and fuzz runs that keep the service's promises honest.

Each is a library here and a test elsewhere: a short run inside ``make test`` and a long
one in ``make torture`` (``LMSP_CAMPAIGN=long``). Each prints its figures.
"""
