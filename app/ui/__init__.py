"""The Streamlit side: the sidebar's inputs (``inputs``), the patch page's views (``views``), the plain CNN
against the equivariant one (``comparison``), the slide page for whole slides and images (``slide_page``), Table 1's
attention variants side by side (``variants_page``) and the caches the pages share (``caches``). ``app/main.py``
puts them on one page.

May import: every other ``app`` package, :mod:`models` and Streamlit. The only package that imports
Streamlit; nothing else in the project imports it. Widgets return values; the numbers and pictures come from
below.
"""
