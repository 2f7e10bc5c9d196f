"""Sphinx configuration of the course website (built by ``python -m authoring.site``).

The source folder Sphinx reads is a staging copy that authoring/site.py writes (the README as the
landing page, the notebooks with their stored outputs, the glossary and the instructor guide);
this folder holds only the configuration and the site's stylesheet.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from authoring.site import repository_url  # noqa: E402

REPOSITORY = repository_url()

project = "Multi-head attention, from one head to GQA"
author = "the mha-course authors"
copyright = "the mha-course authors, MIT licence"

extensions = [
    "myst_nb",  # Markdown and notebooks (MyST); renders the stored outputs
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax 3 shipped inside the site: math renders with no internet
]

# the notebooks are committed executed: render what they store, never run them
nb_execution_mode = "off"
# widget outputs are replaced by a note before the build (site.py), so no widget JavaScript
# (which MyST-NB would load from a CDN) is needed
nb_ipywidgets_js = {}
nb_merge_streams = True
nb_render_markdown_format = "myst"  # Markdown that cells display (the course map in 00) links like the text

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 4  # `[...](#a-heading)` links, as on GitHub

exclude_patterns = ["notebooks/student/**"]  # the student edition is offered as downloads
suppress_warnings = ["myst.header"]  # notebooks may skip a heading level (e.g. quiz headings)

# one search for both languages: jieba cuts the Chinese pages into words (Latin words are indexed
# as in English); the Chinese pages live under zh/ and notebooks/zh/
html_search_language = "zh"
# Sphinx 9 names the stemmer of the Latin words after the language ("ChineseStemmer") while it ships
# the English one for Chinese pages: the page then fails with "ChineseStemmer is not defined". The
# Chinese search, its stemmer named as the code it ships (only that line of language_data.js changes).
try:
    from sphinx.search import languages as _search_languages
    from sphinx.search.zh import SearchChinese as _SearchChinese

    if _SearchChinese.js_stemmer_rawcode == "english-stemmer.js":

        class _CourseSearchChinese(_SearchChinese):
            language_name = "English"

        _search_languages["zh"] = _CourseSearchChinese
except ImportError:  # pragma: no cover
    pass
try:  # jieba announces its dictionary on stderr: not a build message
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
except ImportError:  # pragma: no cover - the site extra installs it
    pass

html_theme = "sphinx_book_theme"
html_title = "Multi-head attention"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_copy_source = True  # the theme's download button offers each page's .ipynb / .md
html_theme_options = {
    "repository_url": REPOSITORY,
    "use_repository_button": True,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "show_toc_level": 2,
    "home_page_in_toc": True,
}
html_context = {"default_mode": "light"}  # the figures have white backgrounds (and an unset mode logs an error)
