"""Training data: recipe data sources and mixes (``data_sources``), collation of rendered examples
(``collate``), diffusion rows and packing (``diffusion_data``), the logic-text corpus (``logic_text``) and
the step-separator check (``separator``)."""
