"""The Streamlit side: the sidebar's inputs (``inputs``), the patch page's views (``views``), the plain CNN
against the equivariant one (``comparison``) and the region page (``region_page``). ``app/main.py`` puts them
on one page.

May import: every other ``app`` package, :mod:`models` and Streamlit. The only package that imports
Streamlit; nothing else in the project imports it. Widgets return values; the numbers and pictures come from
below.
"""
