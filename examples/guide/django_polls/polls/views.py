from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from polls.models import Vote


def index(request: HttpRequest) -> HttpResponse:
    # A query: it answers 500 unless the release command's migrate made the table.
    return HttpResponse(f"polls: {Vote.objects.count()} votes\n")


@csrf_exempt
def vote(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return HttpResponse("POST a choice\n", status=405)
    Vote.objects.create(choice=request.POST.get("choice", ""))
    return HttpResponse("voted\n", status=201)


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok\n")
