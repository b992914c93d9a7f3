from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "webapp.accounts"
    label = "accounts"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_save

        from webapp.accounts.signals import user_saved

        post_save.connect(user_saved, sender=get_user_model(), dispatch_uid="accounts.user_saved")
