"""Adapters that hand our vector envs (or any gymnasium 1.x vector env) to other RL libraries.

Each adapter imports its library when its module is imported: ``envs.adapters.sb3`` needs the
``sb3`` extra. Importing ``envs`` never imports them.
"""
