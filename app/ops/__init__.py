"""Operations tooling, apart from the serving code: the RayService renderer, the dashboard panels, the generated
configuration reference."""
