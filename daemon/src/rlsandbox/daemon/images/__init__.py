"""Sandbox images built locally from Debian packages (see ``sandbox_images/images.toml``)."""

from rlsandbox.daemon.images.builder import BuildOutcome, ImageBuilder, default_images_dir, load_images

__all__ = ["BuildOutcome", "ImageBuilder", "default_images_dir", "load_images"]
