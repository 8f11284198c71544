"""Trainer callbacks: the curriculum and time budget (``curriculum``), generation validation
(``validation``) and the progress bar / run log (``progress``)."""
